/* embed_load.c - embeddings against a running gpud until it goes away, for
 * tests/cuemu/run's failing-device checks (gpud-load sends generations
 * only): how every embedding ended.
 *
 *   embed_load SOCKET THREADS SECONDS [AFTER FILE]
 *
 * Each thread connects once and asks for embeddings of short texts, one
 * after another, until the connection breaks or SECONDS pass. With AFTER
 * and FILE, the call that makes AFTER embeddings done creates FILE (the
 * checks' fault injection): the device fails once gpud is seen serving,
 * however slowly a loaded machine brings it there, never at a set time.
 * A call that waits longer than 60 s ends with SW_EBUSY (a hang). Prints one line,
 * "embed: N ok, SW_EDEVICE:N SW_ECLOSED:N other:N", and exits 0 when
 * every call ended with success, SW_EDEVICE or SW_ECLOSED (a refusal
 * while gpud drains, or gpud gone).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/err.h"
#include "proto/client.h"

#define MAX_THREADS 16

static const char *sock;
static double until;
static unsigned fault_after; /* 0: no FILE to create */
static const char *fault_file;
static atomic_uint ok, device, closed, other;
static char other_msg[2 * SW_ERR_MAX];
static pthread_mutex_t other_mu = PTHREAD_MUTEX_INITIALIZER;

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void touch(const char *path)
{
	FILE *f = fopen(path, "w");

	if (!f) {
		perror(path);
		exit(2);
	}
	fclose(f);
}

static void *run(void *arg)
{
	static const char *const texts[] = {
		"Once upon a time there was a little dog.",
		"The sun was shining and the birds sang in the park all day long.",
		"Lily and Ben went to the park.",
	};
	struct proto_client_opts o;
	struct proto_client *c = NULL;
	char err[SW_ERR_MAX];
	uintptr_t t = (uintptr_t)arg;

	proto_client_opts_default(&o);
	o.timeout_ms = 60000;
	if (proto_client_connect(&c, sock, &o, err, sizeof(err))) {
		atomic_fetch_add(&closed, 1);
		return NULL;
	}
	for (uint32_t i = 0; now_s() < until; i++) {
		const char *x = texts[(i + t) % 3];
		float *vec = NULL;
		uint32_t dim = 0;
		int rc = proto_client_embed(c, x, strlen(x), &vec, &dim, err, sizeof(err));

		free(vec);
		if (rc == 0) {
			if (atomic_fetch_add(&ok, 1) + 1 == fault_after)
				touch(fault_file);
			continue;
		}
		if (rc == SW_EDEVICE) {
			atomic_fetch_add(&device, 1);
			nanosleep(&(struct timespec){ 0, 10000000 }, NULL);
			continue;
		}
		if (rc == SW_ECLOSED) {
			atomic_fetch_add(&closed, 1);
			if (!proto_client_alive(c))
				break; /* gpud is gone */
			nanosleep(&(struct timespec){ 0, 10000000 }, NULL);
			continue; /* refused while it drains */
		}
		atomic_fetch_add(&other, 1);
		pthread_mutex_lock(&other_mu);
		snprintf(other_msg, sizeof(other_msg), "%s: %s", sw_errname(rc), err);
		pthread_mutex_unlock(&other_mu);
		break;
	}
	proto_client_close(c);
	return NULL;
}

int main(int argc, char **argv)
{
	pthread_t th[MAX_THREADS];
	int n;

	if ((argc != 4 && argc != 6) || (n = atoi(argv[2])) < 1 || n > MAX_THREADS ||
	    atof(argv[3]) <= 0 || (argc == 6 && atoi(argv[4]) < 1)) {
		fprintf(stderr, "usage: embed_load SOCKET THREADS(1-%d) SECONDS [AFTER FILE]\n",
			MAX_THREADS);
		return 2;
	}
	if (argc == 6) {
		fault_after = (unsigned)atoi(argv[4]);
		fault_file = argv[5];
	}
	sock = argv[1];
	until = now_s() + atof(argv[3]);
	for (int i = 0; i < n; i++)
		if (pthread_create(&th[i], NULL, run, (void *)(uintptr_t)i)) {
			fprintf(stderr, "embed_load: cannot start a thread\n");
			return 2;
		}
	for (int i = 0; i < n; i++)
		pthread_join(th[i], NULL);
	printf("embed: %u ok, SW_EDEVICE:%u SW_ECLOSED:%u other:%u%s%s\n", atomic_load(&ok),
	       atomic_load(&device), atomic_load(&closed), atomic_load(&other),
	       other_msg[0] ? " first other: " : "", other_msg);
	return atomic_load(&other) == 0 ? 0 : 1;
}
