/* par.c - sw_par_ranges, sw_par_cpus (par.h). */
#include "common/par.h"

#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <unistd.h>

struct par_part {
	sw_par_fn fn;
	void *arg;
	int part;
	uint64_t begin, end;
};

static void *par_run(void *p)
{
	struct par_part *x = p;

	x->fn(x->arg, x->part, x->begin, x->end);
	return NULL;
}

void sw_par_ranges(uint64_t n, int nparts, sw_par_fn fn, void *arg)
{
	struct par_part parts[SW_PAR_MAX];
	pthread_t th[SW_PAR_MAX];
	bool made[SW_PAR_MAX] = { false };
	uint64_t per;

	if (nparts < 1)
		nparts = 1;
	if (nparts > SW_PAR_MAX)
		nparts = SW_PAR_MAX;
	if (!n)
		return;
	per = (n + (uint64_t)nparts - 1) / (uint64_t)nparts;
	for (int k = 0; k < nparts; k++) {
		uint64_t b = (uint64_t)k * per < n ? (uint64_t)k * per : n;
		uint64_t e = b + per < n ? b + per : n;

		parts[k] = (struct par_part){ fn, arg, k, b, e };
		if (k && e > b)
			made[k] = pthread_create(&th[k], NULL, par_run, &parts[k]) == 0;
	}
	par_run(&parts[0]);
	for (int k = 1; k < nparts; k++) {
		if (made[k])
			pthread_join(th[k], NULL);
		else if (parts[k].end > parts[k].begin)
			par_run(&parts[k]); /* no thread: the caller's */
	}
}

int sw_par_cpus(int max)
{
	cpu_set_t set;
	long c = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set)
							      : sysconf(_SC_NPROCESSORS_ONLN);

	if (c < 1)
		c = 1;
	if (max > 0 && c > max)
		c = max;
	return (int)c;
}
