/* http_test.c - gpud-http against a real gpud (stories260K), driven by
 * curl (a third-party client: whole and streamed requests with -N) and by
 * raw sockets where a test needs control curl does not give (a client
 * that leaves mid-stream, 200 streams at once, malformed requests).
 *
 * Checked: greedy completions equal `gpud generate` for the same prompt;
 * a streamed answer concatenated equals the whole one and ends with
 * "data: [DONE]"; chat agrees with `gpud generate --chat` (stories260K
 * has no chat template: both refuse, the front with 400); embeddings
 * equal gpud's EMBED reply (float and base64); every error status (400
 * naming the parameter, 401, 404, 405, 411, 413, 429 with Retry-After,
 * 503 while gpud is away, 431, 408 is left to the unit of time and not
 * waited for); a client leaving mid-stream leaves no request in gpud's
 * STATS; 200 concurrent streams all complete with the same greedy text;
 * /health, /metrics, /v1/models; start-up refusals (a key file of mode
 * 0644, a non-loopback listener without keys, a bad address); exit 0 on
 * SIGTERM.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <fcntl.h>
#include <jansson.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "proto/client.h"
#include "proto/frame.h"
#include "tests/integration/gpud_harness.h"

#ifndef GPUD_HTTP_BIN
#error "GPUD_HTTP_BIN must name the gpud-http binary"
#endif

#define MODEL_ID "stories260K"
#define PROMPT "Once upon a time"

struct front {
	pid_t pid;
	int port;
	char out[GPUD_IT_PATH_MAX];
};

static int free_port(void)
{
	struct sockaddr_in sa = { .sin_family = AF_INET };
	socklen_t sl = sizeof(sa);
	int fd = socket(AF_INET, SOCK_STREAM, 0), port;

	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	assert_int_equal(getsockname(fd, (struct sockaddr *)&sa, &sl), 0);
	port = ntohs(sa.sin_port);
	close(fd);
	return port;
}

/* Runs gpud-http with args (NULL-terminated, after the binary). */
static pid_t spawn_front(const struct gpud_it *d, struct front *f, const char *const *extra)
{
	const char *argv[16];
	char listen[64];
	int n = 0;

	f->port = free_port();
	snprintf(listen, sizeof(listen), "127.0.0.1:%d", f->port);
	snprintf(f->out, sizeof(f->out), "%s/http.out", d->dir);
	argv[n++] = GPUD_HTTP_BIN;
	argv[n++] = "--config";
	argv[n++] = d->config;
	argv[n++] = "--listen";
	argv[n++] = listen;
	for (int i = 0; extra && extra[i]; i++)
		argv[n++] = extra[i];
	argv[n] = NULL;
	f->pid = fork();
	assert_true(f->pid >= 0);
	if (f->pid == 0) {
		int fd = open(f->out, O_WRONLY | O_CREAT | O_APPEND, 0644);
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		dup2(fd, 1);
		dup2(fd, 2);
		execv(argv[0], (char **)argv);
		_exit(127);
	}
	return f->pid;
}

/* A raw HTTP exchange: sends req, reads to EOF (the request says
 * Connection: close). Returns the status; *body gets the body,
 * de-chunked (malloc'd). */
static int raw(int port, const char *req, size_t reqlen, char **body, char **head_out)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	int fd = socket(AF_INET, SOCK_STREAM, 0), st = -1;
	size_t len = 0, cap = 1 << 16;
	char *buf = malloc(cap + 1);

	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	assert_int_equal(write(fd, req, reqlen), (ssize_t)reqlen);
	for (;;) {
		if (len == cap)
			buf = realloc(buf, (cap *= 2) + 1);
		ssize_t r = read(fd, buf + len, cap - len);
		if (r <= 0)
			break;
		len += (size_t)r;
	}
	close(fd);
	buf[len] = '\0';
	sscanf(buf, "HTTP/1.1 %d", &st);
	char *hend = strstr(buf, "\r\n\r\n");
	if (!hend) {
		free(buf);
		*body = strdup("");
		return st;
	}
	*hend = '\0';
	char *b = hend + 4;
	if (head_out)
		*head_out = strdup(buf);
	if (strcasestr(buf, "Transfer-Encoding: chunked")) {
		char *out = malloc(strlen(b) + 1), *p = b;
		size_t o = 0;
		for (;;) {
			unsigned long n = strtoul(p, &p, 16);
			p += 2;
			if (n == 0)
				break;
			memcpy(out + o, p, n);
			o += n;
			p += n + 2;
		}
		out[o] = '\0';
		*body = out;
	} else {
		*body = strdup(b);
	}
	free(buf);
	return st;
}

static int post(int port, const char *path, const char *json, const char *extra_head,
		char **body, char **head)
{
	char *req = malloc(strlen(json) + 1024);
	int n = sprintf(req, "POST %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
			"Content-Type: application/json\r\n%sContent-Length: %zu\r\n\r\n%s", path,
			extra_head ? extra_head : "", strlen(json), json);
	int st = raw(port, req, (size_t)n, body, head);
	free(req);
	return st;
}

static int get(int port, const char *path, char **body)
{
	char req[512];
	int n = snprintf(req, sizeof(req), "GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
			 path);
	return raw(port, req, (size_t)n, body, NULL);
}

/* Runs a shell command (curl), returning its stdout (malloc'd). */
static char *sh(const char *fmt, ...)
{
	char cmd[8192];
	va_list ap;
	size_t len = 0, cap = 1 << 16;
	char *out = malloc(cap + 1);
	FILE *p;

	va_start(ap, fmt);
	vsnprintf(cmd, sizeof(cmd), fmt, ap);
	va_end(ap);
	p = popen(cmd, "r");
	assert_non_null(p);
	size_t r;
	while ((r = fread(out + len, 1, cap - len, p)) > 0) {
		len += r;
		if (len == cap)
			out = realloc(out, (cap *= 2) + 1);
	}
	pclose(p);
	out[len] = '\0';
	return out;
}

static void wait_health(const struct front *f, int want)
{
	for (int i = 0; i < 300; i++) {
		char *b = NULL;
		int st = -1;
		struct sockaddr_in sa = { .sin_family = AF_INET,
					  .sin_port = htons((uint16_t)f->port) };
		int fd = socket(AF_INET, SOCK_STREAM, 0);
		sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
		bool up = connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
		close(fd);
		if (up)
			st = get(f->port, "/health", &b);
		free(b);
		if (st == want)
			return;
		usleep(100 * 1000);
	}
	fail_msg("/health never answered %d", want);
}

static int stop_front(struct front *f)
{
	int status;

	kill(f->pid, SIGTERM);
	for (int i = 0; i < 200; i++) {
		if (waitpid(f->pid, &status, WNOHANG) == f->pid) {
			f->pid = 0;
			return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
		}
		usleep(50 * 1000);
	}
	kill(f->pid, SIGKILL);
	waitpid(f->pid, &status, 0);
	f->pid = 0;
	return -1;
}

static json_t *jparse(const char *s)
{
	json_error_t je;
	json_t *j = json_loads(s, 0, &je);
	if (!j)
		fail_msg("not JSON (%s): %.500s", je.text, s);
	return j;
}

/* Concatenates choices[0].text (or .delta.content) of every data: event;
 * checks the stream ends with [DONE]; returns the finish reason seen. */
/* The text of a stream: a completion's, or a chat delta's member field
 * ("content", "reasoning_content"), concatenated. */
static char *sse_field(const char *body, bool chat, const char *field, char *finish, size_t flen)
{
	char *out = calloc(1, strlen(body) + 1);
	const char *p = body;
	bool done = false;

	finish[0] = '\0';
	while ((p = strstr(p, "data: "))) {
		p += 6;
		const char *e = strstr(p, "\n\n");
		assert_non_null(e);
		if (strncmp(p, "[DONE]", 6) == 0) {
			done = true;
			break;
		}
		char *one = strndup(p, (size_t)(e - p));
		json_t *j = jparse(one);
		json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
		json_t *t = chat ? json_object_get(json_object_get(ch, "delta"), field)
				 : json_object_get(ch, "text");
		if (json_is_string(t))
			strcat(out, json_string_value(t));
		if (json_is_string(json_object_get(ch, "finish_reason")))
			snprintf(finish, flen, "%s", json_string_value(json_object_get(ch, "finish_reason")));
		json_decref(j);
		free(one);
		p = e;
	}
	if (!done)
		fail_msg("no [DONE] in the stream: %.3000s", body);
	return out;
}

static char *sse_text(const char *body, bool chat, char *finish, size_t flen)
{
	return sse_field(body, chat, "content", finish, flen);
}

static void start_all(struct gpud_it_fix *fx, struct front *f, const char *gpud_extra)
{
	struct gpud_it_opts o = { .devices = "[\"cpu\"]", .threads = 1,
				  .gpud_extra = gpud_extra };
	assert_int_equal(gpud_it_start(&fx->d[0], &o), 0);
	spawn_front(&fx->d[0], f, NULL);
	wait_health(f, 200);
}

static void test_completions(void **state)
{
	struct gpud_it_fix *fx = *state;
	struct front f;
	char gen[4096], *b, *h, finish[16];
	const char *args[] = { "generate", "--model", GPUD_IT_MODEL, "--prompt", PROMPT,
			       "--max-tokens", "40", NULL };

	start_all(fx, &f, "\"queue\": {\"per_connection\": 512, \"global\": 1024}");
	assert_int_equal(gpud_it_run_cmd(args, gen, sizeof(gen), 120000), 0);
	/* stdout (the text) then stderr's figures line */
	char *figs = strstr(gen, "prompt tokens: ");
	assert_non_null(figs);
	*figs = '\0';

	/* curl, whole: equals gpud generate (greedy). */
	b = sh("curl -s http://127.0.0.1:%d/v1/completions -H 'Content-Type: application/json' "
	       "-d '{\"model\":\"" MODEL_ID "\",\"prompt\":\"" PROMPT "\",\"max_tokens\":40,"
	       "\"temperature\":0}'", f.port);
	json_t *j = jparse(b);
	json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
	assert_string_equal(json_string_value(json_object_get(ch, "text")), gen);
	assert_string_equal(json_string_value(json_object_get(ch, "finish_reason")), "length");
	json_t *u = json_object_get(j, "usage");
	assert_int_equal(json_integer_value(json_object_get(u, "completion_tokens")), 40);
	assert_true(json_integer_value(json_object_get(u, "prompt_tokens")) > 0);
	assert_non_null(json_object_get(json_object_get(u, "prompt_tokens_details"),
					"cached_tokens"));
	assert_string_equal(json_string_value(json_object_get(j, "object")), "text_completion");
	json_decref(j);
	free(b);

	/* curl -N, streamed: the events concatenated equal the whole text. */
	b = sh("curl -sN http://127.0.0.1:%d/v1/completions -H 'Content-Type: application/json' "
	       "-d '{\"model\":\"" MODEL_ID "\",\"prompt\":\"" PROMPT "\",\"max_tokens\":40,"
	       "\"temperature\":0,\"stream\":true,\"stream_options\":{\"include_usage\":true}}'",
	       f.port);
	char *t = sse_text(b, false, finish, sizeof(finish));
	assert_string_equal(t, gen);
	assert_string_equal(finish, "length");
	assert_non_null(strstr(b, "\"completion_tokens\":40"));
	free(t);
	free(b);

	/* A stop string ends with finish_reason "stop" and is not shown. */
	assert_int_equal(post(f.port, "/v1/completions",
			      "{\"model\":\"" MODEL_ID "\",\"prompt\":\"" PROMPT "\","
			      "\"max_tokens\":40,\"temperature\":0,\"stop\":[\"girl\"]}", NULL, &b,
			      NULL), 200);
	j = jparse(b);
	ch = json_array_get(json_object_get(j, "choices"), 0);
	assert_string_equal(json_string_value(json_object_get(ch, "finish_reason")), "stop");
	assert_null(strstr(json_string_value(json_object_get(ch, "text")), "girl"));
	assert_true(strncmp(gen, json_string_value(json_object_get(ch, "text")),
			    strlen(json_string_value(json_object_get(ch, "text")))) == 0);
	json_decref(j);
	free(b);

	/* A prompt sent twice: the second reports the prefix cache's tokens
	 * in usage.prompt_tokens_details.cached_tokens. */
	const char *lp = "{\"model\":\"" MODEL_ID "\",\"max_tokens\":2,\"prompt\":\"Once upon a "
			 "time there was a little girl named Lily who loved to play in the park "
			 "with her friends every day. She had a red ball and a blue kite and a "
			 "small dog called Max who followed her everywhere she went.\"}";
	int64_t cached[2];
	for (int i = 0; i < 2; i++) {
		assert_int_equal(post(f.port, "/v1/completions", lp, NULL, &b, NULL), 200);
		j = jparse(b);
		cached[i] = json_integer_value(json_object_get(json_object_get(
			json_object_get(j, "usage"), "prompt_tokens_details"), "cached_tokens"));
		json_decref(j);
		free(b);
	}
	assert_int_equal(cached[0], 0);
	assert_true(cached[1] > 0);

	/* The prompt as swarm segments with an explicit causal descriptor
	 * is answered (segments are tokenized one by one, so the text may
	 * differ from the one-string prompt's). */
	assert_int_equal(post(f.port, "/v1/completions",
			      "{\"model\":\"" MODEL_ID "\",\"max_tokens\":40,\"temperature\":0,"
			      "\"swarm\":{\"segments\":[\"Once upon\",\" a time\"],"
			      "\"visibility\":[[0],[0,1],[0,1,2]]}}", NULL, &b, NULL), 200);
	j = jparse(b);
	ch = json_array_get(json_object_get(j, "choices"), 0);
	assert_true(strlen(json_string_value(json_object_get(ch, "text"))) > 0);
	json_decref(j);
	free(b);
	/* A descriptor that hides the first segment from the generation is
	 * accepted and answered (its text may differ). */
	assert_int_equal(post(f.port, "/v1/completions",
			      "{\"model\":\"" MODEL_ID "\",\"max_tokens\":5,"
			      "\"swarm\":{\"segments\":[\"Once upon\",\" a time\"],"
			      "\"visibility\":[[0],[1],[1,2]]}}", NULL, &b, NULL), 200);
	free(b);

	/* Chat: stories260K has no chat template; the front agrees with
	 * `gpud generate --chat` (both refuse, the front with a 400, both
	 * naming the choice to make). test_chat gives it a format. */
	const char *cargs[] = { "generate", "--model", GPUD_IT_MODEL, "--prompt", PROMPT,
				"--max-tokens", "10", "--chat", NULL };
	assert_int_not_equal(gpud_it_run_cmd(cargs, gen, sizeof(gen), 120000), 0);
	assert_non_null(strstr(gen, "no tokenizer.chat_template"));
	assert_int_equal(post(f.port, "/v1/chat/completions",
			      "{\"model\":\"" MODEL_ID "\",\"messages\":[{\"role\":\"user\","
			      "\"content\":\"" PROMPT "\"}],\"temperature\":0}", NULL, &b, NULL),
			 400);
	assert_non_null(strstr(b, "no tokenizer.chat_template"));
	free(b);
	b = sh("curl -sN http://127.0.0.1:%d/v1/chat/completions -d '{\"model\":\"" MODEL_ID
	       "\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"stream\":true}' "
	       "-w ' %%{http_code}'", f.port);
	assert_non_null(strstr(b, "no tokenizer.chat_template"));
	assert_non_null(strstr(b, " 400"));
	free(b);

	/* /v1/models, /metrics. */
	assert_int_equal(get(f.port, "/v1/models", &b), 200);
	assert_non_null(strstr(b, "\"id\":\"" MODEL_ID "\""));
	free(b);
	assert_int_equal(get(f.port, "/metrics", &b), 200);
	assert_non_null(strstr(b, "gpud_http_requests_total{route=\"completions\",status=\"2xx\"}"));
	assert_non_null(strstr(b, "gpud_http_request_seconds_bucket{route=\"completions\",le=\"+Inf\"}"));
	free(b);
	(void)h;

	assert_int_equal(stop_front(&f), 0);
	fx->done = true;
}

/* Chat with a format chosen in the config (stories260K has no template):
 * greedy chat through the front, whole and streamed, equals `gpud generate
 * --chat-format` for the same message. */
static void test_chat(void **state)
{
	struct gpud_it_fix *fx = *state;
	struct front f;
	char gen[4096], finish[16], *b;
	const char *args[] = { "generate", "--model", GPUD_IT_MODEL, "--prompt", PROMPT,
			       "--max-tokens", "24", "--chat-format", "llama2", NULL };

	start_all(fx, &f, "\"chat_format\": \"llama2\"");
	assert_int_equal(gpud_it_run_cmd(args, gen, sizeof(gen), 120000), 0);
	char *figs = strstr(gen, "prompt tokens: ");
	assert_non_null(figs);
	*figs = '\0';
	assert_true(strlen(gen) > 0);

	b = sh("curl -s http://127.0.0.1:%d/v1/chat/completions -H 'Content-Type: application/json' "
	       "-d '{\"model\":\"" MODEL_ID "\",\"messages\":[{\"role\":\"user\",\"content\":"
	       "\"" PROMPT "\"}],\"max_tokens\":24,\"temperature\":0}'", f.port);
	json_t *j = jparse(b);
	json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
	json_t *msg = json_object_get(ch, "message");
	assert_string_equal(json_string_value(json_object_get(msg, "role")), "assistant");
	assert_string_equal(json_string_value(json_object_get(msg, "content")), gen);
	assert_string_equal(json_string_value(json_object_get(j, "object")), "chat.completion");
	json_decref(j);
	free(b);

	b = sh("curl -sN http://127.0.0.1:%d/v1/chat/completions -H 'Content-Type: application/json' "
	       "-d '{\"model\":\"" MODEL_ID "\",\"messages\":[{\"role\":\"user\",\"content\":"
	       "\"" PROMPT "\"}],\"max_tokens\":24,\"temperature\":0,\"stream\":true}'", f.port);
	char *txt = sse_text(b, true, finish, sizeof(finish));
	assert_string_equal(txt, gen);
	free(txt);
	free(b);

	assert_int_equal(stop_front(&f), 0);
	fx->done = true;
}

/* A reasoning model's format (DeepSeek R1's: the prompt opens <think>,
 * chosen in the config; stories260K never writes </think>): the whole
 * greedy answer of `gpud generate --chat-format deepseek-r1` is the
 * message's reasoning_content and its content is empty, whole and
 * streamed; reasoning_format "none" puts it back in the content. */
static void test_chat_reasoning(void **state)
{
	struct gpud_it_fix *fx = *state;
	struct front f;
	char gen[4096], finish[16], *b;
	const char *args[] = { "generate", "--model", GPUD_IT_MODEL, "--prompt", PROMPT,
			       "--max-tokens", "24", "--chat-format", "deepseek-r1", NULL };
	const char *req = "{\"model\":\"" MODEL_ID "\",\"messages\":[{\"role\":\"user\","
			  "\"content\":\"" PROMPT "\"}],\"max_tokens\":24,\"temperature\":0%s}";
	char body[512];

	start_all(fx, &f, "\"chat_format\": \"deepseek-r1\"");
	assert_int_equal(gpud_it_run_cmd(args, gen, sizeof(gen), 120000), 0);
	char *figs = strstr(gen, "prompt tokens: ");
	assert_non_null(figs);
	*figs = '\0';
	const char *thought = gen + strspn(gen, " \n\r\t"); /* leading whitespace dropped */
	assert_true(strlen(thought) > 0);
	assert_null(strstr(gen, "</think>"));

	snprintf(body, sizeof(body), req, "");
	b = sh("curl -s http://127.0.0.1:%d/v1/chat/completions -H 'Content-Type: application/json' "
	       "-d '%s'", f.port, body);
	json_t *j = jparse(b);
	json_t *msg = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "message");
	assert_string_equal(json_string_value(json_object_get(msg, "reasoning_content")), thought);
	assert_string_equal(json_string_value(json_object_get(msg, "content")), "");
	json_decref(j);
	free(b);

	snprintf(body, sizeof(body), req, ",\"stream\":true");
	b = sh("curl -sN http://127.0.0.1:%d/v1/chat/completions -H 'Content-Type: application/json' "
	       "-d '%s'", f.port, body);
	char *txt = sse_field(b, true, "reasoning_content", finish, sizeof(finish));
	assert_string_equal(txt, thought);
	free(txt);
	txt = sse_text(b, true, finish, sizeof(finish));
	assert_string_equal(txt, "");
	free(txt);
	free(b);

	snprintf(body, sizeof(body), req, ",\"reasoning_format\":\"none\"");
	b = sh("curl -s http://127.0.0.1:%d/v1/chat/completions -H 'Content-Type: application/json' "
	       "-d '%s'", f.port, body);
	j = jparse(b);
	msg = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "message");
	assert_string_equal(json_string_value(json_object_get(msg, "content")), gen);
	assert_null(json_object_get(msg, "reasoning_content"));
	json_decref(j);
	free(b);

	assert_int_equal(stop_front(&f), 0);
	fx->done = true;
}

static void test_embeddings(void **state)
{
	struct gpud_it_fix *fx = *state;
	struct front f;
	char err[1024], *b;
	float *vec;
	uint32_t dim;

	start_all(fx, &f, "\"chat_format\": \"llama2\"");
	struct proto_client *c = gpud_it_connect(&fx->d[0]);
	assert_non_null(c);
	assert_int_equal(proto_client_embed(c, "hello world", 11, &vec, &dim, err, sizeof(err)), 0);

	b = sh("curl -s http://127.0.0.1:%d/v1/embeddings -d '{\"model\":\"" MODEL_ID
	       "\",\"input\":[\"hello world\",\"x\"]}'", f.port);
	json_t *j = jparse(b);
	json_t *data = json_object_get(j, "data");
	assert_int_equal(json_array_size(data), 2);
	json_t *e = json_object_get(json_array_get(data, 0), "embedding");
	assert_int_equal(json_array_size(e), dim);
	for (uint32_t i = 0; i < dim; i++)
		assert_true((float)json_number_value(json_array_get(e, i)) == vec[i]);
	assert_true(json_integer_value(json_object_get(json_object_get(j, "usage"),
						       "prompt_tokens")) > 0);
	json_decref(j);
	free(b);

	/* base64: little-endian float32, bit for bit. */
	b = sh("curl -s http://127.0.0.1:%d/v1/embeddings -d '{\"model\":\"" MODEL_ID
	       "\",\"input\":\"hello world\",\"encoding_format\":\"base64\"}'", f.port);
	j = jparse(b);
	const char *s = json_string_value(json_object_get(json_array_get(json_object_get(j, "data"),
									  0), "embedding"));
	assert_non_null(s);
	char *dec = sh("printf '%%s' '%s' | base64 -d | od -An -v -tx1 | tr -d ' \\n'", s);
	char want[65536] = "";
	for (uint32_t i = 0; i < dim; i++) {
		uint8_t le[4];
		proto_putf32(le, vec[i]);
		sprintf(want + strlen(want), "%02x%02x%02x%02x", le[0], le[1], le[2], le[3]);
	}
	assert_string_equal(dec, want);
	free(dec);
	json_decref(j);
	free(b);
	free(vec);
	proto_client_close(c);
	assert_int_equal(stop_front(&f), 0);
	fx->done = true;
}

static void expect_err(int port, const char *path, const char *json, int status,
		       const char *param)
{
	char *b;
	int st = post(port, path, json, NULL, &b, NULL);

	if (st != status)
		fail_msg("%s: status %d, want %d: %s (request %.200s)", path, st, status, b, json);
	json_t *j = jparse(b);
	json_t *e = json_object_get(j, "error");
	assert_non_null(json_object_get(e, "message"));
	assert_non_null(json_object_get(e, "type"));
	if (param)
		assert_string_equal(json_string_value(json_object_get(e, "param")), param);
	json_decref(j);
	free(b);
}

static void test_errors(void **state)
{
	struct gpud_it_fix *fx = *state;
	struct front f;
	char *b, *h;

	start_all(fx, &f, NULL);
	expect_err(f.port, "/v1/completions", "{not json", 400, NULL);
	expect_err(f.port, "/v1/completions", "{\"model\":\"" MODEL_ID "\",\"prompt\":\"a\","
		   "\"n\":17}", 400, "n");
	expect_err(f.port, "/v1/completions", "{\"model\":\"" MODEL_ID "\",\"prompt\":\"a\","
		   "\"n\":2,\"stream\":true}", 400, "n");
	expect_err(f.port, "/v1/completions", "{\"model\":\"" MODEL_ID "\",\"prompt\":\"a\","
		   "\"temperature\":7}", 400, "temperature");
	expect_err(f.port, "/v1/completions", "{\"model\":\"" MODEL_ID "\",\"prompt\":\"a\","
		   "\"max_tokens\":0}", 400, "max_tokens");
	expect_err(f.port, "/v1/completions", "{\"prompt\":\"a\"}", 400, "model");
	expect_err(f.port, "/v1/completions", "{\"model\":\"" MODEL_ID "\",\"prompt\":\"a\","
		   "\"swarm\":{\"visibility\":[[0],[2]]}}", 400, "swarm.visibility");
	expect_err(f.port, "/v1/chat/completions", "{\"model\":\"" MODEL_ID "\",\"messages\":"
		   "[{\"role\":\"robot\",\"content\":\"a\"}]}", 400, "messages[0].role");
	expect_err(f.port, "/v1/embeddings", "{\"model\":\"" MODEL_ID "\",\"input\":\"a\","
		   "\"encoding_format\":\"hex\"}", 400, "encoding_format");
	expect_err(f.port, "/v1/completions", "{\"model\":\"gpt-4\",\"prompt\":\"a\"}", 404,
		   "model");
	expect_err(f.port, "/v1/nothing", "{}", 404, NULL);
	/* prompt longer than the context: 400, not 500 */
	char *big = malloc(300000);
	strcpy(big, "{\"model\":\"" MODEL_ID "\",\"max_tokens\":2000,\"prompt\":\"");
	for (int i = 0; i < 3000; i++)
		strcat(big, "once ");
	strcat(big, "\"}");
	expect_err(f.port, "/v1/completions", big, 400, NULL);
	/* 413: over http.max_body_bytes (1 MiB by default) */
	size_t n = (2u << 20);
	char *huge = malloc(n + 64);
	memset(huge, ' ', n);
	memcpy(huge, "{\"a\":1", 6);
	huge[n - 1] = '}';
	huge[n] = '\0';
	assert_int_equal(post(f.port, "/v1/completions", huge, NULL, &b, NULL), 413);
	free(b);
	b = sh("curl -s -o /dev/null -w '%%{http_code}' http://127.0.0.1:%d/v1/completions "
	       "-H 'Content-Type: application/json' --data-binary @%s", f.port, "/dev/null");
	assert_string_equal(b, "400"); /* empty body: bad JSON */
	free(b);
	free(huge);
	free(big);
	/* 405, 411, 400 on a bad head, 431, 505 */
	assert_int_equal(get(f.port, "/v1/completions", &b), 405);
	free(b);
	const char *r411 = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
			   "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n";
	assert_int_equal(raw(f.port, r411, strlen(r411), &b, NULL), 411);
	free(b);
	const char *r400 = "GET /health HTTP/1.1\r\nBad Header\r\n\r\n";
	assert_int_equal(raw(f.port, r400, strlen(r400), &b, NULL), 400);
	free(b);
	char *r431 = malloc(40000);
	strcpy(r431, "GET /health HTTP/1.1\r\nX-Long: ");
	memset(r431 + strlen(r431), 'a', 30000);
	strcpy(r431 + 30030, "\r\n\r\n");
	assert_int_equal(raw(f.port, r431, strlen(r431), &b, NULL), 431);
	free(b);
	free(r431);
	const char *r505 = "GET /health HTTP/2.0\r\n\r\n";
	assert_int_equal(raw(f.port, r505, strlen(r505), &b, NULL), 505);
	free(b);
	/* keep-alive: two requests on one connection */
	const char *two = "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"
			  "GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
	assert_int_equal(raw(f.port, two, strlen(two), &b, &h), 200);
	free(h);
	assert_non_null(strstr(b, "HTTP/1.1 200 OK")); /* the second response follows */
	free(b);

	/* 503 while gpud is away, /health too; back once it returns. */
	assert_int_equal(gpud_it_stop(&fx->d[0], SIGTERM, 60000), 0);
	wait_health(&f, 503);
	expect_err(f.port, "/v1/completions", "{\"model\":\"" MODEL_ID "\",\"prompt\":\"a\"}", 503,
		   NULL);
	assert_int_equal(gpud_it_spawn(&fx->d[0], NULL), 0);
	assert_int_equal(gpud_it_wait_ready(&fx->d[0], 60000), 0);
	wait_health(&f, 200);
	assert_int_equal(post(f.port, "/v1/completions", "{\"model\":\"" MODEL_ID "\","
			      "\"prompt\":\"a\",\"max_tokens\":3}", NULL, &b, NULL), 200);
	free(b);
	assert_int_equal(stop_front(&f), 0);
	fx->done = true;
}

static void test_auth(void **state)
{
	struct gpud_it_fix *fx = *state;
	struct front f;
	char keys[GPUD_IT_PATH_MAX], *b;
	struct gpud_it_opts o = { .devices = "[\"cpu\"]", .threads = 1 };

	assert_int_equal(gpud_it_start(&fx->d[0], &o), 0);
	snprintf(keys, sizeof(keys), "%s/keys", fx->d[0].dir);
	FILE *kf = fopen(keys, "w");
	fputs("# keys\nsk-one\n\nsk-two\n", kf);
	fclose(kf);

	/* mode 0644: refused at start, exit 1 */
	chmod(keys, 0644);
	const char *ka[] = { "--api-key-file", keys, NULL };
	spawn_front(&fx->d[0], &f, ka);
	int status;
	waitpid(f.pid, &status, 0);
	assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 1);
	assert_true(gpud_it_file_has(f.out, "must be mode 0600"));

	chmod(keys, 0600);
	spawn_front(&fx->d[0], &f, ka);
	wait_health(&f, 200); /* /health needs no key */
	expect_err(f.port, "/v1/completions", "{\"model\":\"" MODEL_ID "\",\"prompt\":\"a\"}", 401,
		   NULL);
	assert_int_equal(post(f.port, "/v1/completions", "{\"model\":\"" MODEL_ID "\","
			      "\"prompt\":\"a\",\"max_tokens\":2}", "Authorization: Bearer sk-nope\r\n",
			      &b, NULL), 401);
	free(b);
	assert_int_equal(post(f.port, "/v1/completions", "{\"model\":\"" MODEL_ID "\","
			      "\"prompt\":\"a\",\"max_tokens\":2}", "Authorization: Bearer sk-two\r\n",
			      &b, NULL), 200);
	free(b);
	b = sh("curl -s -o /dev/null -w '%%{http_code}' -H 'Authorization: Bearer sk-one' "
	       "http://127.0.0.1:%d/v1/models", f.port);
	assert_string_equal(b, "200");
	free(b);
	assert_int_equal(stop_front(&f), 0);

	/* no keys on a non-loopback listener, and a bad address: exit 1 */
	const char *cmd[] = { GPUD_HTTP_BIN, "--config", fx->d[0].config, "--listen",
			      "0.0.0.0:1", NULL };
	char out[2048];
	b = sh("%s --config %s --listen 0.0.0.0:%d 2>&1; echo rc=$?", cmd[0], fx->d[0].config,
	       free_port());
	assert_non_null(strstr(b, "not a loopback address"));
	assert_non_null(strstr(b, "rc=1"));
	free(b);
	b = sh("%s --config %s --listen nowhere 2>&1; echo rc=$?", cmd[0], fx->d[0].config);
	assert_non_null(strstr(b, "expected \"HOST:PORT\""));
	assert_non_null(strstr(b, "rc=1"));
	free(b);
	(void)out;
	fx->done = true;
}

/* Connects and sends a streamed request; returns the socket. */
static int stream_open(int port, const char *json)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	char req[4096];
	int n = snprintf(req, sizeof(req), "POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
			 "Connection: close\r\nContent-Length: %zu\r\n\r\n%s", strlen(json), json);

	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	assert_int_equal(write(fd, req, (size_t)n), n);
	return fd;
}

static void test_streams(void **state)
{
	struct gpud_it_fix *fx = *state;
	struct front f;
	char buf[4096], *b;

	start_all(fx, &f, "\"queue\": {\"per_connection\": 512, \"global\": 1024}");
	struct proto_client *c = gpud_it_connect(&fx->d[0]);
	assert_non_null(c);

	/* A client leaving mid-stream: its request is cancelled at once. */
	int fd = stream_open(f.port, "{\"model\":\"" MODEL_ID "\",\"prompt\":\"Once\","
			     "\"max_tokens\":2000,\"temperature\":1,\"stream\":true}");
	ssize_t r = read(fd, buf, sizeof(buf));
	assert_true(r > 0);
	assert_non_null(strstr(buf, "200 OK"));
	close(fd);
	int64_t inflight = -1, cancelled = 0;
	for (int i = 0; i < 100; i++) {
		json_t *st = gpud_it_stats(c, false);
		gpud_it_jint(st, "requests.in_flight", &inflight);
		gpud_it_jint(st, "requests.cancelled", &cancelled);
		json_decref(st);
		if (inflight == 0)
			break;
		usleep(20 * 1000);
	}
	assert_int_equal(inflight, 0);
	assert_true(cancelled >= 1);

	/* 200 concurrent streams: every one completes with the greedy text. */
	assert_int_equal(post(f.port, "/v1/completions", "{\"model\":\"" MODEL_ID "\","
			      "\"prompt\":\"" PROMPT "\",\"max_tokens\":16,\"temperature\":0}",
			      NULL, &b, NULL), 200);
	json_t *j = jparse(b);
	char *want = strdup(json_string_value(json_object_get(
		json_array_get(json_object_get(j, "choices"), 0), "text")));
	json_decref(j);
	free(b);
	enum { N = 200 };
	static int fds[N];
	static char *got[N];
	static size_t glen[N];
	for (int i = 0; i < N; i++) {
		fds[i] = stream_open(f.port, "{\"model\":\"" MODEL_ID "\",\"prompt\":\"" PROMPT "\","
				     "\"max_tokens\":16,\"temperature\":0,\"stream\":true}");
		got[i] = calloc(1, 1 << 16);
		glen[i] = 0;
	}
	int open_n = N;
	while (open_n > 0) {
		struct pollfd p[N];
		int map[N], k = 0;
		for (int i = 0; i < N; i++)
			if (fds[i] >= 0) {
				p[k] = (struct pollfd){ .fd = fds[i], .events = POLLIN };
				map[k++] = i;
			}
		assert_true(poll(p, (nfds_t)k, 120000) > 0);
		for (int q = 0; q < k; q++) {
			if (!(p[q].revents & (POLLIN | POLLHUP | POLLERR)))
				continue;
			int i = map[q];
			r = read(fds[i], got[i] + glen[i], (1 << 16) - 1 - glen[i]);
			if (r <= 0) {
				close(fds[i]);
				fds[i] = -1;
				open_n--;
			} else {
				glen[i] += (size_t)r;
			}
		}
	}
	for (int i = 0; i < N; i++) {
		char *hend = strstr(got[i], "\r\n\r\n"), finish[16];
		assert_non_null(hend);
		assert_true(strncmp(got[i], "HTTP/1.1 200", 12) == 0);
		/* de-chunk */
		char *p = hend + 4, *out = calloc(1, glen[i] + 1);
		size_t o = 0;
		for (;;) {
			unsigned long n = strtoul(p, &p, 16);
			p += 2;
			if (n == 0)
				break;
			memcpy(out + o, p, n);
			o += n;
			p += n + 2;
		}
		char *t = sse_text(out, false, finish, sizeof(finish));
		assert_string_equal(t, want);
		free(t);
		free(out);
		free(got[i]);
	}
	free(want);
	proto_client_close(c);
	assert_int_equal(stop_front(&f), 0);
	fx->done = true;
}

/* gpud's queue limit reached: 429 with Retry-After. */
static void test_busy(void **state)
{
	struct gpud_it_fix *fx = *state;
	struct front f;
	char *b, *h = NULL;

	start_all(fx, &f, "\"max_seqs\": 1, \"queue\": {\"per_connection\": 1, \"global\": 1}");
	int fd = stream_open(f.port, "{\"model\":\"" MODEL_ID "\",\"prompt\":\"Once\","
			     "\"max_tokens\":2000,\"temperature\":1,\"stream\":true}");
	char buf[256];
	assert_true(read(fd, buf, sizeof(buf)) > 0);
	int st = post(f.port, "/v1/completions", "{\"model\":\"" MODEL_ID "\",\"prompt\":\"a\","
		      "\"max_tokens\":2}", NULL, &b, &h);
	if (st != 429)
		fail_msg("status %d, want 429: %s", st, b);
	assert_non_null(strstr(h, "Retry-After: 1"));
	assert_non_null(strstr(b, "rate_limit_error"));
	free(b);
	free(h);
	close(fd);

	/* n = 2 with room for one request: the first choice is taken (a long
	 * one: still running when the second comes), the second refused, so
	 * the answer is 429 and the first is cancelled (a plain request fits
	 * again after) */
	const char *one = "{\"model\":\"" MODEL_ID "\",\"prompt\":\"a\",\"max_tokens\":2}";
	for (int i = 0; i < 100 && (st = post(f.port, "/v1/completions", one, NULL, &b, &h)) != 200;
	     i++) {
		free(b);
		free(h);
		usleep(50 * 1000);
	}
	assert_int_equal(st, 200);
	free(b);
	free(h);
	st = post(f.port, "/v1/completions", "{\"model\":\"" MODEL_ID "\",\"prompt\":\"Once\","
		  "\"max_tokens\":2000,\"n\":2}", NULL, &b, &h);
	if (st != 429)
		fail_msg("n = 2 with room for one: status %d, want 429: %s", st, b);
	free(b);
	free(h);
	for (int i = 0; i < 100 && (st = post(f.port, "/v1/completions", one, NULL, &b, &h)) != 200;
	     i++) {
		free(b);
		free(h);
		usleep(50 * 1000);
	}
	assert_int_equal(st, 200);
	free(b);
	free(h);
	assert_int_equal(stop_front(&f), 0);
	fx->done = true;
}


/* Timeouts and the connection limit, with an http section of small
 * values (gpud-http reads its own copy of the configuration). */
static int dial(int port)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	return fd;
}

static void read_all(int fd, char *buf, size_t cap)
{
	size_t n = 0;
	ssize_t r;

	while (n + 1 < cap && (r = read(fd, buf + n, cap - 1 - n)) > 0)
		n += (size_t)r;
	buf[n] = '\0';
	close(fd);
}

static void test_limits(void **state)
{
	struct gpud_it_fix *fx = *state;
	struct gpud_it_opts o = { .devices = "[\"cpu\"]", .threads = 1 };
	struct gpud_it d2;
	struct front f;
	char path[GPUD_IT_PATH_MAX], buf[4096];
	json_error_t je;

	assert_int_equal(gpud_it_start(&fx->d[0], &o), 0);
	json_t *cfg = json_load_file(fx->d[0].config, 0, &je);
	assert_non_null(cfg);
	json_object_set_new(cfg, "http", json_pack("{s:i, s:i, s:i}", "header_timeout_ms", 300,
						   "idle_timeout_ms", 500, "max_connections", 2));
	snprintf(path, sizeof(path), "%s/http.json", fx->d[0].dir);
	assert_int_equal(json_dump_file(cfg, path, 0), 0);
	json_decref(cfg);
	d2 = fx->d[0];
	snprintf(d2.config, sizeof(d2.config), "%s", path);
	spawn_front(&d2, &f, NULL);
	wait_health(&f, 200);

	/* a head that stops coming: 408, then closed */
	int fd = dial(f.port);
	assert_int_equal(write(fd, "GET /health HTTP/1.1\r\nHo", 24), 24);
	read_all(fd, buf, sizeof(buf));
	assert_true(strncmp(buf, "HTTP/1.1 408 ", 13) == 0);
	/* a body that stops coming: 408 too */
	fd = dial(f.port);
	const char *p = "POST /v1/completions HTTP/1.1\r\nContent-Length: 10\r\n\r\n{";
	assert_int_equal(write(fd, p, strlen(p)), (ssize_t)strlen(p));
	read_all(fd, buf, sizeof(buf));
	assert_true(strncmp(buf, "HTTP/1.1 408 ", 13) == 0);
	/* an idle connection is closed without a word (the closed ones
	 * above have left: they count against max_connections) */
	usleep(200 * 1000);
	fd = dial(f.port);
	read_all(fd, buf, sizeof(buf));
	assert_string_equal(buf, "");
	/* the third connection at once: 503 */
	usleep(200 * 1000);
	int a = dial(f.port), b = dial(f.port);
	fd = dial(f.port);
	read_all(fd, buf, sizeof(buf));
	assert_true(strncmp(buf, "HTTP/1.1 503 ", 13) == 0);
	assert_non_null(strstr(buf, "too_many_connections"));
	close(a);
	close(b);
	assert_int_equal(stop_front(&f), 0);
	fx->done = true;
}

/* Log probabilities through the HTTP API (chat and completions, whole
 * and streamed): asking for them changes no word; the tokens' bytes spell
 * the answer; the streamed lists equal the whole one's; a greedy token is
 * its own likeliest alternative. */
static json_t *sse_logprobs(const char *body, bool chat)
{
	json_t *all = json_array();
	const char *p = body;

	while ((p = strstr(p, "data: "))) {
		p += 6;
		const char *e = strstr(p, "\n\n");
		assert_non_null(e);
		if (strncmp(p, "[DONE]", 6) == 0)
			break;
		char *one = strndup(p, (size_t)(e - p));
		json_t *j = jparse(one);
		json_t *lp = json_object_get(json_array_get(json_object_get(j, "choices"), 0),
					     "logprobs");
		json_t *list = chat ? json_object_get(lp, "content") : json_object_get(lp, "tokens");
		size_t i;
		json_t *x;
		json_array_foreach(list, i, x) {
			if (chat) {
				json_array_append(all, x);
			} else {
				json_array_append_new(all, json_pack(
					"{s:O, s:O, s:O, s:O}", "token", x, "logprob",
					json_array_get(json_object_get(lp, "token_logprobs"), i),
					"top", json_array_get(json_object_get(lp, "top_logprobs"), i),
					"offset", json_array_get(json_object_get(lp, "text_offset"), i)));
			}
		}
		json_decref(j);
		free(one);
		p = e;
	}
	return all;
}

static void test_logprobs(void **state)
{
	struct gpud_it_fix *fx = *state;
	struct front f;
	char finish[16], *b;
	const char *chat = "\"messages\":[{\"role\":\"user\",\"content\":\"" PROMPT "\"}]";

	start_all(fx, &f, "\"chat_format\": \"llama2\"");
	for (int sampled = 0; sampled < 2; sampled++) {
		const char *samp = sampled ? "\"temperature\":0.8,\"seed\":5" : "\"temperature\":0";
		/* the answer without log probabilities */
		b = sh("curl -s http://127.0.0.1:%d/v1/chat/completions -d '{\"model\":\"" MODEL_ID
		       "\",%s,\"max_tokens\":24,%s}'", f.port, chat, samp);
		json_t *j = jparse(b);
		char *want = strdup(json_string_value(json_object_get(json_object_get(
			json_array_get(json_object_get(j, "choices"), 0), "message"), "content")));
		json_decref(j);
		free(b);

		b = sh("curl -s http://127.0.0.1:%d/v1/chat/completions -d '{\"model\":\"" MODEL_ID
		       "\",%s,\"max_tokens\":24,%s,\"logprobs\":true,\"top_logprobs\":3}'",
		       f.port, chat, samp);
		j = jparse(b);
		json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
		assert_string_equal(json_string_value(json_object_get(json_object_get(ch, "message"),
								      "content")), want);
		json_t *content = json_object_get(json_object_get(ch, "logprobs"), "content");
		assert_true(json_array_size(content) > 0);
		assert_true(json_array_size(content) <= 24);
		char spelled[4096] = "";
		size_t n = 0, i;
		json_t *x;
		json_array_foreach(content, i, x) {
			json_t *bytes = json_object_get(x, "bytes"), *top = json_object_get(x, "top_logprobs");
			size_t k;
			json_t *y;
			double lp = json_real_value(json_object_get(x, "logprob"));
			assert_true(lp <= 0 && lp > -100);
			json_array_foreach(bytes, k, y)
				spelled[n++] = (char)json_integer_value(y);
			assert_int_equal(json_array_size(top), 3);
			for (k = 1; k < 3; k++)
				assert_true(json_real_value(json_object_get(json_array_get(top, k),
									    "logprob")) <=
					    json_real_value(json_object_get(json_array_get(top, k - 1),
									    "logprob")));
			if (!sampled) {
				assert_string_equal(json_string_value(json_object_get(
							    json_array_get(top, 0), "token")),
						    json_string_value(json_object_get(x, "token")));
				assert_true(json_real_value(json_object_get(json_array_get(top, 0),
									    "logprob")) == lp);
			}
		}
		spelled[n] = '\0';
		/* the answer's bytes (a chat answer's first token may carry the space
		 * the text was trimmed of) */
		assert_non_null(strstr(spelled, want));
		assert_true(n <= strlen(want) + 1);

		/* streamed: the same list, chunk by chunk */
		char *sb = sh("curl -sN http://127.0.0.1:%d/v1/chat/completions -d '{\"model\":\""
			      MODEL_ID "\",%s,\"max_tokens\":24,%s,\"logprobs\":true,"
			      "\"top_logprobs\":3,\"stream\":true}'", f.port, chat, samp);
		char *txt = sse_text(sb, true, finish, sizeof(finish));
		assert_string_equal(txt, want);
		json_t *streamed = sse_logprobs(sb, true);
		if (!json_equal(streamed, content)) {
			char *a = json_dumps(streamed, JSON_COMPACT), *c = json_dumps(content, JSON_COMPACT);
			fail_msg("streamed logprobs differ:\n%s\n%s", a, c);
		}
		json_decref(streamed);
		free(txt);
		free(sb);
		printf("    logprobs (%s chat): %zu tokens, first %s at %.4f\n",
		       sampled ? "drawn" : "greedy", json_array_size(content),
		       json_string_value(json_object_get(json_array_get(content, 0), "token")),
		       json_real_value(json_object_get(json_array_get(content, 0), "logprob")));
		json_decref(j);
		free(b);
		free(want);
	}

	/* completions: tokens spell the text, offsets count its characters,
	 * and the stream's lists equal the whole one's */
	b = sh("curl -s http://127.0.0.1:%d/v1/completions -d '{\"model\":\"" MODEL_ID "\","
	       "\"prompt\":\"" PROMPT "\",\"max_tokens\":30,\"temperature\":0,\"logprobs\":2}'",
	       f.port);
	json_t *j = jparse(b);
	json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
	const char *text = json_string_value(json_object_get(ch, "text"));
	json_t *lp = json_object_get(ch, "logprobs");
	json_t *toks = json_object_get(lp, "tokens"), *offs = json_object_get(lp, "text_offset");
	json_t *tops = json_object_get(lp, "top_logprobs"), *tlp = json_object_get(lp, "token_logprobs");
	char spelled[4096] = "";
	size_t i;
	json_t *x;
	assert_int_equal(json_array_size(toks), 30);
	assert_int_equal(json_array_size(offs), 30);
	assert_int_equal(json_array_size(tlp), 30);
	json_array_foreach(toks, i, x) {
		assert_int_equal(json_integer_value(json_array_get(offs, i)), (json_int_t)strlen(spelled));
		strcat(spelled, json_string_value(x)); /* stories260K's pieces are ASCII */
		assert_int_equal(json_object_size(json_array_get(tops, i)), 2);
		assert_true(json_real_value(json_array_get(tlp, i)) <= 0);
	}
	assert_string_equal(spelled, text);
	char *sb = sh("curl -sN http://127.0.0.1:%d/v1/completions -d '{\"model\":\"" MODEL_ID
		      "\",\"prompt\":\"" PROMPT "\",\"max_tokens\":30,\"temperature\":0,"
		      "\"logprobs\":2,\"stream\":true}'", f.port);
	json_t *streamed = sse_logprobs(sb, false);
	assert_int_equal(json_array_size(streamed), 30);
	json_array_foreach(streamed, i, x) {
		assert_true(json_equal(json_object_get(x, "token"), json_array_get(toks, i)));
		assert_true(json_equal(json_object_get(x, "logprob"), json_array_get(tlp, i)));
		assert_true(json_equal(json_object_get(x, "top"), json_array_get(tops, i)));
		assert_true(json_equal(json_object_get(x, "offset"), json_array_get(offs, i)));
	}
	json_decref(streamed);
	free(sb);

	/* echo: the prompt scored alone (max_tokens 0), then the prompt and
	 * the same 30 tokens with the same numbers after it */
	char *eb = sh("curl -s http://127.0.0.1:%d/v1/completions -d '{\"model\":\"" MODEL_ID
		      "\",\"prompt\":\"" PROMPT "\",\"max_tokens\":0,\"echo\":true,"
		      "\"logprobs\":1}'", f.port);
	json_t *ej = jparse(eb);
	json_t *ech = json_array_get(json_object_get(ej, "choices"), 0);
	json_t *elp = json_object_get(ech, "logprobs");
	json_int_t n_prompt = json_integer_value(json_object_get(json_object_get(ej, "usage"),
								 "prompt_tokens"));
	assert_string_equal(json_string_value(json_object_get(ech, "text")), PROMPT);
	assert_string_equal(json_string_value(json_object_get(ech, "finish_reason")), "length");
	assert_int_equal(json_integer_value(json_object_get(json_object_get(ej, "usage"),
							    "completion_tokens")), 0);
	assert_int_equal(json_array_size(json_object_get(elp, "tokens")), (size_t)n_prompt);
	assert_true(json_is_null(json_array_get(json_object_get(elp, "token_logprobs"), 0)));
	assert_true(json_is_null(json_array_get(json_object_get(elp, "top_logprobs"), 0)));
	for (size_t k = 1; k < (size_t)n_prompt; k++) {
		assert_true(json_real_value(json_array_get(json_object_get(elp, "token_logprobs"),
							   k)) <= 0);
		assert_int_equal(json_object_size(json_array_get(json_object_get(elp, "top_logprobs"),
								 k)), 1);
	}
	printf("    echo, max_tokens 0: %d prompt tokens scored, the second at %.4f\n",
	       (int)n_prompt, json_real_value(json_array_get(json_object_get(elp,
										"token_logprobs"), 1)));
	json_decref(ej);
	free(eb);
	eb = sh("curl -s http://127.0.0.1:%d/v1/completions -d '{\"model\":\"" MODEL_ID "\","
		"\"prompt\":\"" PROMPT "\",\"max_tokens\":30,\"temperature\":0,\"echo\":true,"
		"\"logprobs\":2}'", f.port);
	ej = jparse(eb);
	ech = json_array_get(json_object_get(ej, "choices"), 0);
	elp = json_object_get(ech, "logprobs");
	char want_echo[8192];
	snprintf(want_echo, sizeof(want_echo), "%s%s", PROMPT, text);
	assert_string_equal(json_string_value(json_object_get(ech, "text")), want_echo);
	assert_int_equal(json_array_size(json_object_get(elp, "tokens")), (size_t)n_prompt + 30);
	for (size_t k = 0; k < 30; k++) {
		assert_true(json_equal(json_array_get(json_object_get(elp, "tokens"), n_prompt + k),
				       json_array_get(toks, k)));
		assert_true(fabs(json_real_value(json_array_get(json_object_get(elp, "token_logprobs"),
							       n_prompt + k)) -
				 json_real_value(json_array_get(tlp, k))) < 1e-4);
	}
	json_decref(ej);
	free(eb);
	json_decref(j);
	free(b);
	assert_int_equal(stop_front(&f), 0);
	fx->done = true;
}

/* POSTs body to /v1/completions; the parsed answer (and its choice). */
static json_t *complete(const struct front *f, const char *body, json_t **choice)
{
	char *b = sh("curl -s http://127.0.0.1:%d/v1/completions -d '%s'", f->port, body);
	json_t *j = jparse(b);
	free(b);
	*choice = json_array_get(json_object_get(j, "choices"), 0);
	return j;
}

static json_int_t usage_of(json_t *j, const char *k)
{
	return json_integer_value(json_object_get(json_object_get(j, "usage"), k));
}

/* Prompts given as token ids (what evaluation harnesses send): the same
 * answer as the text they spell, in every accepted shape and as
 * swarm.segments; echo gives their text; bad ids are refused. And
 * logit_bias, which names tokens by id too. */
static void test_token_prompts(void **state)
{
	struct gpud_it_fix *fx = *state;
	struct front f;
	char body[8192], ids[2048] = "", half[2][1024] = { "", "" }, err[256], *b;
	int32_t *tok = NULL;
	uint32_t n = 0;
	json_t *j, *ch;

	start_all(fx, &f, "\"chat_format\": \"llama2\"");
	struct proto_client *c = gpud_it_connect(&fx->d[0]);
	assert_non_null(c);
	assert_int_equal(proto_client_tokenize(c, PROMPT, strlen(PROMPT), PROTO_TOK_ADD_BOS, &tok,
					       &n, err, sizeof(err)), 0);
	proto_client_close(c);
	assert_true(n >= 3);
	for (uint32_t i = 0; i < n; i++) {
		size_t l = strlen(ids);
		snprintf(ids + l, sizeof(ids) - l, "%s%d", i ? "," : "", tok[i]);
		l = strlen(half[i >= n / 2]);
		snprintf(half[i >= n / 2] + l, sizeof(half[0]) - l, "%s%d",
			 l ? "," : "", tok[i]);
	}

	/* /tokenize gives gpud's ids, in vLLM's shape and llama.cpp's */
	char want_tok[2200];
	snprintf(want_tok, sizeof(want_tok), "{\"tokens\":[%s],\"count\":%u} 200", ids, n);
	b = sh("curl -s -w ' %%{http_code}' http://127.0.0.1:%d/tokenize -d '{\"model\":\""
	       MODEL_ID "\",\"prompt\":\"" PROMPT "\"}'", f.port);
	assert_string_equal(b, want_tok);
	free(b);
	snprintf(want_tok, sizeof(want_tok), "{\"tokens\":[%s],\"count\":%u} 200",
		 strchr(ids, ',') + 1, n - 1);
	b = sh("curl -s -w ' %%{http_code}' http://127.0.0.1:%d/tokenize -d '{\"content\":\""
	       PROMPT "\",\"add_special\":false}'", f.port);
	assert_string_equal(b, want_tok);
	free(b);
	b = sh("curl -s -w ' %%{http_code}' http://127.0.0.1:%d/v1/tokenize -d '{\"model\":\"x\","
	       "\"prompt\":\"a\"}'", f.port);
	assert_non_null(strstr(b, "} 404"));
	free(b);
	/* /detokenize: the text back, the BOS by its text unless skipped */
	b = sh("curl -s -w ' %%{http_code}' http://127.0.0.1:%d/detokenize -d '{\"model\":\""
	       MODEL_ID "\",\"tokens\":[%s],\"skip_special_tokens\":true}'", f.port, ids);
	assert_string_equal(b, "{\"prompt\":\"" PROMPT "\",\"content\":\"" PROMPT "\"} 200");
	free(b);
	b = sh("curl -s -w ' %%{http_code}' http://127.0.0.1:%d/v1/detokenize -d '{\"tokens\":"
	       "[%s]}'", f.port, ids);
	assert_string_equal(b, "{\"prompt\":\"<s> " PROMPT "\",\"content\":\"<s> " PROMPT
			    "\"} 200");
	free(b);
	b = sh("curl -s -w ' %%{http_code}' http://127.0.0.1:%d/detokenize -d '{\"tokens\":"
	       "[1,99999999]}'", f.port);
	if (!strstr(b, "token 1: id 99999999 is not in the vocabulary") || !strstr(b, "} 400"))
		fail_msg("/detokenize of a bad id: %s", b);
	free(b);

	j = complete(&f, "{\"model\":\"" MODEL_ID "\",\"prompt\":\"" PROMPT "\",\"max_tokens\":"
		     "20,\"temperature\":0}", &ch);
	char *want = strdup(json_string_value(json_object_get(ch, "text")));
	assert_int_equal(usage_of(j, "prompt_tokens"), n);
	json_decref(j);
	const char *shapes[] = { "[%s]", "[[%s]]" };
	for (int k = 0; k < 2; k++) {
		char pr[2100];
		snprintf(pr, sizeof(pr), shapes[k], ids);
		snprintf(body, sizeof(body), "{\"model\":\"" MODEL_ID "\",\"prompt\":%s,"
			 "\"max_tokens\":20,\"temperature\":0}", pr);
		j = complete(&f, body, &ch);
		assert_string_equal(json_string_value(json_object_get(ch, "text")), want);
		assert_int_equal(usage_of(j, "prompt_tokens"), n);
		json_decref(j);
	}
	/* as two segments of ids (the prompt, when given, their concatenation) */
	snprintf(body, sizeof(body), "{\"model\":\"" MODEL_ID "\",\"prompt\":[%s],\"swarm\":"
		 "{\"segments\":[[%s],[%s]]},\"max_tokens\":20,\"temperature\":0}", ids,
		 half[0], half[1]);
	j = complete(&f, body, &ch);
	assert_string_equal(json_string_value(json_object_get(ch, "text")), want);
	assert_int_equal(usage_of(j, "prompt_tokens"), n);
	json_decref(j);
	/* the ids as they are: without the BOS, one token fewer */
	snprintf(body, sizeof(body), "{\"model\":\"" MODEL_ID "\",\"prompt\":[%s],"
		 "\"max_tokens\":1,\"temperature\":0}", strchr(ids, ',') + 1);
	j = complete(&f, body, &ch);
	assert_int_equal(usage_of(j, "prompt_tokens"), n - 1);
	json_decref(j);

	/* echo: the prompt's text, alone and before the answer; its tokens
	 * spell it, text and ids alike */
	snprintf(body, sizeof(body), "{\"model\":\"" MODEL_ID "\",\"prompt\":[%s],\"echo\":true,"
		 "\"max_tokens\":0}", ids);
	j = complete(&f, body, &ch);
	assert_string_equal(json_string_value(json_object_get(ch, "text")), PROMPT);
	assert_true(json_is_null(json_object_get(ch, "logprobs")));
	assert_int_equal(usage_of(j, "completion_tokens"), 0);
	json_decref(j);
	for (int k = 0; k < 2; k++) {
		char pr[2100];
		snprintf(pr, sizeof(pr), k ? "[%s]" : "\"" PROMPT "\"", ids);
		snprintf(body, sizeof(body), "{\"model\":\"" MODEL_ID "\",\"prompt\":%s,"
			 "\"echo\":true,\"logprobs\":1,\"max_tokens\":20,\"temperature\":0}", pr);
		j = complete(&f, body, &ch);
		char both[4096], spelled[4096] = "";
		snprintf(both, sizeof(both), "%s%s", PROMPT, want);
		assert_string_equal(json_string_value(json_object_get(ch, "text")), both);
		json_t *lp = json_object_get(ch, "logprobs"), *x;
		size_t i;
		assert_int_equal(json_array_size(json_object_get(lp, "tokens")), n + 20);
		json_array_foreach(json_object_get(lp, "tokens"), i, x) {
			assert_int_equal(json_integer_value(json_array_get(
						 json_object_get(lp, "text_offset"), i)),
					 (json_int_t)strlen(spelled));
			strcat(spelled, json_string_value(x));
		}
		assert_string_equal(spelled, both);
		json_decref(j);
	}

	/* logit_bias: +100 forces the prompt's third token at every step
	 * (its text as echo spells it), in completions and chat alike */
	snprintf(body, sizeof(body), "{\"model\":\"" MODEL_ID "\",\"prompt\":[%s],\"echo\":true,"
		 "\"logprobs\":0,\"max_tokens\":0}", ids);
	j = complete(&f, body, &ch);
	char piece[64], forced[256] = "";
	snprintf(piece, sizeof(piece), "%s", json_string_value(json_array_get(json_object_get(
			json_object_get(ch, "logprobs"), "tokens"), 2)));
	json_decref(j);
	for (int k = 0; k < 3; k++)
		strcat(forced, piece);
	snprintf(body, sizeof(body), "{\"model\":\"" MODEL_ID "\",\"prompt\":\"" PROMPT "\","
		 "\"max_tokens\":3,\"temperature\":0.7,\"logit_bias\":{\"%d\":100}}", tok[2]);
	j = complete(&f, body, &ch);
	assert_string_equal(json_string_value(json_object_get(ch, "text")), forced);
	json_decref(j);
	b = sh("curl -s http://127.0.0.1:%d/v1/chat/completions -d '{\"model\":\"" MODEL_ID "\","
	       "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":3,"
	       "\"logit_bias\":{\"%d\":100}}'", f.port, tok[2]);
	j = jparse(b);
	free(b);
	/* a chat answer's text is trimmed of its first space */
	const char *content = json_string_value(json_object_get(json_object_get(json_array_get(
		json_object_get(j, "choices"), 0), "message"), "content"));
	assert_non_null(content);
	assert_non_null(strstr(forced, content));
	assert_true(strlen(content) + 1 >= strlen(forced));
	json_decref(j);
	printf("    logit_bias {%d: 100}: \"%s\"\n", tok[2], forced);

	/* refused, each with its reason */
	const struct {
		const char *prompt, *msg;
	} bad[] = {
		{ "[]", "prompt: expected a string or an array of token ids" },
		{ "[1,-2]", "prompt[1]: expected a token id" },
		{ "[1,\"a\"]", "prompt[1]: expected a token id" },
		{ "[1,2.5]", "prompt[1]: expected a token id" },
		{ "[[1,2],[3]]", "one prompt a request" },
		{ "[1,99999999]", "segment 0: token 1: id 99999999 is not in the vocabulary" },
		{ "[1,2147483648]", "prompt[1]: expected a token id" },
	};
	for (size_t k = 0; k < sizeof(bad) / sizeof(bad[0]); k++) {
		snprintf(body, sizeof(body), "{\"model\":\"" MODEL_ID "\",\"prompt\":%s}",
			 bad[k].prompt);
		b = sh("curl -s -w ' %%{http_code}' http://127.0.0.1:%d/v1/completions -d '%s'",
		       f.port, body);
		if (!strstr(b, bad[k].msg) || !strstr(b, "} 400"))
			fail_msg("prompt %s: %s (wanted 400, \"%s\")", bad[k].prompt, b, bad[k].msg);
		free(b);
	}
	b = sh("curl -s -w ' %%{http_code}' http://127.0.0.1:%d/v1/completions -d '{\"model\":\""
	       MODEL_ID "\",\"prompt\":\"p\",\"logit_bias\":{\"99999999\":1}}'", f.port);
	if (!strstr(b, "logit_bias: token id 99999999 is not in the vocabulary") ||
	    !strstr(b, "} 400"))
		fail_msg("logit_bias out of the vocabulary: %s", b);
	free(b);
	snprintf(body, sizeof(body), "{\"model\":\"" MODEL_ID "\",\"prompt\":\"" PROMPT "\","
		 "\"swarm\":{\"segments\":[[%s],\" there\"]}}", ids);
	b = sh("curl -s -w ' %%{http_code}' http://127.0.0.1:%d/v1/completions -d '%s'",
		     f.port, body);
	assert_non_null(strstr(b, "with swarm.segments of token ids, omit it"));
	free(b);

	free(want);
	free(tok);
	assert_int_equal(stop_front(&f), 0);
	fx->done = true;
}

/* n choices: each its own draw (seed + index, so choice i is the answer
 * of seed + i alone), indices in order, usage counting the prompt once and
 * every choice's tokens; greedy choices agree; chat and log probabilities
 * alike. And the sampling extras (top_k, min_p, repetition_penalty) and a
 * refused response_format. */
static void test_choices(void **state)
{
	struct gpud_it_fix *fx = *state;
	struct front f;
	char body[1024], *b;
	json_t *j, *ch;

	start_all(fx, &f, "\"chat_format\": \"llama2\"");
	j = complete(&f, "{\"model\":\"" MODEL_ID "\",\"prompt\":\"" PROMPT "\",\"max_tokens\":"
		     "24,\"temperature\":1,\"seed\":40,\"n\":4,\"logprobs\":1}", &ch);
	json_t *choices = json_object_get(j, "choices");
	assert_int_equal(json_array_size(choices), 4);
	json_int_t gen = 0;
	int distinct = 0;
	for (size_t i = 0; i < 4; i++) {
		json_t *c = json_array_get(choices, i), *one, *oc;
		assert_int_equal(json_integer_value(json_object_get(c, "index")), (json_int_t)i);
		snprintf(body, sizeof(body), "{\"model\":\"" MODEL_ID "\",\"prompt\":\"" PROMPT "\","
			 "\"max_tokens\":24,\"temperature\":1,\"seed\":%zu,\"logprobs\":1}", 40 + i);
		one = complete(&f, body, &oc);
		assert_string_equal(json_string_value(json_object_get(c, "text")),
				    json_string_value(json_object_get(oc, "text")));
		assert_true(json_equal(json_object_get(json_object_get(c, "logprobs"), "tokens"),
				       json_object_get(json_object_get(oc, "logprobs"), "tokens")));
		gen += usage_of(one, "completion_tokens");
		if (i && strcmp(json_string_value(json_object_get(c, "text")),
				json_string_value(json_object_get(json_array_get(choices, 0), "text"))))
			distinct++;
		assert_int_equal(usage_of(j, "prompt_tokens"), usage_of(one, "prompt_tokens"));
		json_decref(one);
	}
	assert_int_equal(usage_of(j, "completion_tokens"), gen);
	assert_true(distinct > 0);
	printf("    n 4: %d of 3 choices differ from the first; %d tokens in all\n", distinct,
	       (int)gen);
	json_decref(j);

	/* vLLM's and llama.cpp's extras: top_k 1 and min_p 1 at temperature 1
	 * leave only the best token (the greedy answer); a repetition
	 * penalty changes the greedy answer of a story that repeats itself */
	j = complete(&f, "{\"model\":\"" MODEL_ID "\",\"prompt\":\"" PROMPT "\",\"max_tokens\":"
		     "40,\"temperature\":0}", &ch);
	char *greedy = strdup(json_string_value(json_object_get(ch, "text")));
	json_decref(j);
	const char *extras[] = { "\"top_k\":1", "\"min_p\":1", "\"repetition_penalty\":1.5",
				 "\"repeat_penalty\":1.5" };
	for (int k = 0; k < 4; k++) {
		snprintf(body, sizeof(body), "{\"model\":\"" MODEL_ID "\",\"prompt\":\"" PROMPT "\","
			 "\"max_tokens\":40,\"temperature\":%s,\"seed\":5,%s}", k < 2 ? "1" : "0",
			 extras[k]);
		j = complete(&f, body, &ch);
		const char *t = json_string_value(json_object_get(ch, "text"));
		if ((k < 2) != !strcmp(t, greedy))
			fail_msg("%s: \"%s\" against greedy \"%s\"", extras[k], t, greedy);
		json_decref(j);
	}
	free(greedy);
	b = sh("curl -s -w ' %%{http_code}' http://127.0.0.1:%d/v1/chat/completions -d '{\"model\":\""
	       MODEL_ID "\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
	       "\"response_format\":{\"type\":\"json_object\"}}'", f.port);
	if (!strstr(b, "\"param\":\"response_format\"") || !strstr(b, "} 400"))
		fail_msg("response_format json_object: %s", b);
	free(b);

	/* greedy: every choice the same; chat has indices and messages */
	j = complete(&f, "{\"model\":\"" MODEL_ID "\",\"prompt\":\"" PROMPT "\",\"max_tokens\":"
		     "12,\"temperature\":0,\"n\":3}", &ch);
	for (size_t i = 1; i < 3; i++)
		assert_string_equal(json_string_value(json_object_get(json_array_get(
					    json_object_get(j, "choices"), i), "text")),
				    json_string_value(json_object_get(ch, "text")));
	json_decref(j);
	b = sh("curl -s http://127.0.0.1:%d/v1/chat/completions -d '{\"model\":\"" MODEL_ID
	       "\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":8,"
	       "\"n\":2,\"seed\":3}'", f.port);
	j = jparse(b);
	free(b);
	choices = json_object_get(j, "choices");
	assert_int_equal(json_array_size(choices), 2);
	for (size_t i = 0; i < 2; i++) {
		json_t *c = json_array_get(choices, i);
		assert_int_equal(json_integer_value(json_object_get(c, "index")), (json_int_t)i);
		assert_true(json_is_string(json_object_get(json_object_get(c, "message"),
							   "content")));
	}
	json_decref(j);

	/* a client leaving before four long choices are done: all four are
	 * cancelled, nothing stays in flight, and the front serves on */
	struct proto_client *c = gpud_it_connect(&fx->d[0]);
	assert_non_null(c);
	json_t *st = gpud_it_stats(c, false);
	int64_t cancelled0 = 0, inflight = -1, cancelled = 0;
	gpud_it_jint(st, "requests.cancelled", &cancelled0);
	json_decref(st);
	int fd = stream_open(f.port, "{\"model\":\"" MODEL_ID "\",\"prompt\":\"Once\","
			     "\"max_tokens\":2000,\"temperature\":1,\"n\":4}");
	for (int i = 0; i < 100 && inflight < 4; i++) {
		st = gpud_it_stats(c, false);
		gpud_it_jint(st, "requests.in_flight", &inflight);
		json_decref(st);
		if (inflight < 4)
			usleep(5 * 1000);
	}
	close(fd);
	for (int i = 0; i < 200; i++) {
		st = gpud_it_stats(c, false);
		gpud_it_jint(st, "requests.in_flight", &inflight);
		gpud_it_jint(st, "requests.cancelled", &cancelled);
		json_decref(st);
		if (inflight == 0)
			break;
		usleep(20 * 1000);
	}
	assert_int_equal(inflight, 0);
	printf("    n 4, client gone: %d of 4 choices cancelled\n", (int)(cancelled - cancelled0));
	proto_client_close(c);
	j = complete(&f, "{\"model\":\"" MODEL_ID "\",\"prompt\":\"" PROMPT "\",\"max_tokens\":"
		     "4,\"n\":2}", &ch);
	assert_int_equal(json_array_size(json_object_get(j, "choices")), 2);
	json_decref(j);
	assert_int_equal(stop_front(&f), 0);
	fx->done = true;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		GPUD_IT_FIX_TEST(test_completions),
		GPUD_IT_FIX_TEST(test_chat),
		GPUD_IT_FIX_TEST(test_chat_reasoning),
		GPUD_IT_FIX_TEST(test_logprobs),
		GPUD_IT_FIX_TEST(test_token_prompts),
		GPUD_IT_FIX_TEST(test_choices),
		GPUD_IT_FIX_TEST(test_embeddings),
		GPUD_IT_FIX_TEST(test_errors),
		GPUD_IT_FIX_TEST(test_auth),
		GPUD_IT_FIX_TEST(test_streams),
		GPUD_IT_FIX_TEST(test_busy),
		GPUD_IT_FIX_TEST(test_limits),
	};
	signal(SIGPIPE, SIG_IGN);
	if (getenv("HTTP_IT_ONLY"))
		cmocka_set_test_filter(getenv("HTTP_IT_ONLY"));
	return cmocka_run_group_tests(tests, NULL, NULL);
}
