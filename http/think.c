/* think.c - a reasoning model's text split into reasoning and content
 * (http/think.h). */
#include "http/think.h"

#include <string.h>

static const char OPEN[] = "<think>", CLOSE[] = "</think>";

static bool space(char c)
{
	return c == ' ' || c == '\n' || c == '\r' || c == '\t';
}

void http_think_init(struct http_think *t, bool opened, bool detect)
{
	memset(t, 0, sizeof(*t));
	t->mode = opened ? HTTP_THINK_REASON : detect ? HTTP_THINK_DETECT : HTTP_THINK_OFF;
	t->reasoned = t->lead = opened;
}

static void emit(const struct http_think_sink *k, bool reason, const char *s, size_t n)
{
	if (n)
		(reason ? k->reason : k->content)(k->arg, s, n);
}

/* DETECT: whitespace, then <think> byte by byte, kept back; anything else
 * (or more whitespace than hold takes) ends the detection, and what was
 * kept is content. Returns the bytes of s used: fewer than n once the
 * mode has changed. */
static size_t detect(struct http_think *t, const char *s, size_t n,
		     const struct http_think_sink *k)
{
	for (size_t i = 0; i < n; i++) {
		bool ok = t->tag ? s[i] == OPEN[t->tag] : s[i] == '<' || space(s[i]);
		if (!ok || t->n_hold == sizeof(t->hold)) {
			t->mode = HTTP_THINK_CONTENT;
			emit(k, false, t->hold, t->n_hold);
			t->n_hold = 0;
			return i;
		}
		t->hold[t->n_hold++] = s[i];
		if (t->tag || s[i] == '<')
			t->tag++;
		if (t->tag == sizeof(OPEN) - 1) { /* <think> whole: reasoning follows */
			t->mode = HTTP_THINK_REASON;
			t->reasoned = t->lead = true;
			t->n_hold = 0;
			return i + 1;
		}
	}
	return n;
}

/* REASON: runs of reasoning, a "</think>" kept back while it matches. */
static size_t reason(struct http_think *t, const char *s, size_t n,
		     const struct http_think_sink *k)
{
	size_t run = 0;

	if (t->lead) {
		while (run < n && space(s[run]))
			run++;
		if (run == n)
			return n;
		t->lead = false;
	}
	for (size_t i = run; i < n; i++) {
		if (t->n_hold) {
			if (s[i] == CLOSE[t->n_hold]) {
				t->hold[t->n_hold++] = s[i];
				if (t->n_hold == sizeof(CLOSE) - 1) {
					t->mode = HTTP_THINK_GAP;
					t->n_hold = 0;
					return i + 1;
				}
				continue;
			}
			/* not the tag: what was kept is reasoning */
			emit(k, true, t->hold, t->n_hold);
			t->n_hold = 0;
			run = i;
		}
		if (s[i] == '<') {
			emit(k, true, s + run, i - run);
			t->hold[t->n_hold++] = '<';
		}
	}
	if (!t->n_hold)
		emit(k, true, s + run, n - run);
	return n;
}

void http_think_feed(struct http_think *t, const char *s, size_t n,
		     const struct http_think_sink *k)
{
	while (n) {
		size_t used = n;
		switch (t->mode) {
		case HTTP_THINK_OFF:
		case HTTP_THINK_CONTENT:
			emit(k, false, s, n);
			break;
		case HTTP_THINK_DETECT:
			used = detect(t, s, n, k);
			break;
		case HTTP_THINK_REASON:
			used = reason(t, s, n, k);
			break;
		case HTTP_THINK_GAP:
			used = 0;
			while (used < n && space(s[used]))
				used++;
			if (used < n)
				t->mode = HTTP_THINK_CONTENT;
			break;
		}
		s += used;
		n -= used;
	}
}

void http_think_end(struct http_think *t, const struct http_think_sink *k)
{
	emit(k, t->mode == HTTP_THINK_REASON, t->hold, t->n_hold);
	t->n_hold = 0;
}
