/* server_work.c - the loop's work list: what other threads ask of the loop
 * thread (look at a connection, count what waits for ring room), the
 * release of request slots, and the loop's wake-ups that act on both (the
 * uv_async and the staging timer). Shared state: gpud/server_impl.h.
 */
#include <string.h>

#include "common/log.h"
#include "common/time.h"
#include "gpud/server_impl.h"

static void on_timer(uv_timer_t *h);

/* Asks the loop to look at c (doorbell, reap, close). Any thread; c->lock
 * may be held (pend_lock nests inside it). */
void gpud__queue_conn(struct sconn *c)
{
	struct gpud_server *s = c->s;
	pthread_mutex_lock(&s->pend_lock);
	if (!c->queued && s->async_live) {
		c->queued = true;
		s->pend[s->n_pend++] = c->idx;
		uv_async_send(&s->async);
	}
	pthread_mutex_unlock(&s->pend_lock);
}

void gpud__backlog_add(struct gpud_server *s, int d)
{
	pthread_mutex_lock(&s->pend_lock);
	s->backlog = (uint64_t)((int64_t)s->backlog + d);
	if (d > 0 && !s->timer_wanted && s->async_live) {
		s->timer_wanted = true;
		uv_async_send(&s->async);
	}
	pthread_mutex_unlock(&s->pend_lock);
}

/* c->lock held. */
void gpud__doorbell_locked(struct sconn *c, uint16_t type, uint64_t id)
{
	c->db_pending = true;
	c->db_type = type;
	c->db_id = id;
	gpud__queue_conn(c);
}

/* c->lock held: keeps r->backlogged and the counts in step with what r
 * has waiting. */
void gpud__update_backlog_locked(struct gpud_sreq *r)
{
	bool want = r->stage_len || r->fin_pending;
	if (want == r->backlogged)
		return;
	r->backlogged = want;
	gpud__backlog_add(r->c->s, want ? 1 : -1);
}

/* c->lock held: the slot goes back to the pool when nothing needs it any
 * more (ended, records out or dropped, no cancel running). */
void gpud__maybe_release_locked(struct gpud_sreq *r)
{
	struct sconn *c = r->c;
	struct gpud_server *s = c->s;
	if (r->active || r->cancel_pending)
		return;
	if (c->open && (r->fin_pending || r->stage_len))
		return;
	r->fin_pending = false;
	r->stage_len = 0;
	r->stage_lp = false;
	gpud__update_backlog_locked(r);
	if (r->prev)
		r->prev->next = r->next;
	else
		c->reqs = r->next;
	if (r->next)
		r->next->prev = r->prev;
	r->prev = r->next = NULL;
	r->c = NULL;
	c->n_slots--;
	pthread_mutex_lock(&s->slot_lock);
	sw_pool_free_index(s->slots, r->idx);
	pthread_mutex_unlock(&s->slot_lock);
	if (c->n_slots == 0 && c->handle_closed)
		gpud__queue_conn(c);
}

/* c->lock held: r has ended. */
void gpud__end_active_locked(struct gpud_sreq *r)
{
	r->active = false;
	r->c->n_active--;
	atomic_fetch_sub(&r->c->s->in_flight, 1);
}

void gpud__on_async(uv_async_t *h)
{
	struct gpud_server *s = h->data;
	pthread_mutex_lock(&s->pend_lock);
	uint32_t n = s->n_pend;
	memcpy(s->work, s->pend, n * sizeof(*s->work));
	for (uint32_t i = 0; i < n; i++)
		s->conns[s->work[i]].queued = false;
	s->n_pend = 0;
	bool start = s->timer_wanted && !s->timer_on && !s->closed;
	if (start)
		s->timer_on = true;
	pthread_mutex_unlock(&s->pend_lock);
	if (start)
		uv_timer_start(&s->timer, on_timer, TIMER_MS, TIMER_MS);
	for (uint32_t i = 0; i < n; i++) {
		struct sconn *c = &s->conns[s->work[i]];
		pthread_mutex_lock(&c->lock);
		bool db = c->db_pending, broken = c->broken;
		uint16_t type = c->db_type;
		uint64_t id = c->db_id;
		c->db_pending = false;
		bool reap = c->handle_closed && c->n_slots == 0;
		pthread_mutex_unlock(&c->lock);
		if (broken) {
			log_warn("conn %llu (pid %d): corrupt ring tail; closing",
				 (unsigned long long)c->serial, (int)c->pid);
			gpud__close_conn(c, "corrupt ring");
		} else if (db && c->state == CONN_OPEN) {
			gpud__send_doorbell(c, type, id);
		}
		if (reap && c->state == CONN_CLOSED) {
			gpud__reap_conn(c);
			if (s->accept_pending && s->listening) {
				s->accept_pending = false;
				gpud__accept_one(s);
			}
		}
	}
}

static void on_timer(uv_timer_t *h)
{
	struct gpud_server *s = h->data;
	uint64_t now = sw_now_ns();
	for (uint32_t i = 0; i < s->p.max_connections; i++) {
		struct sconn *c = &s->conns[i];
		if (c->state != CONN_OPEN || !c->hello)
			continue;
		pthread_mutex_lock(&c->lock);
		uint32_t stalled = gpud__flush_conn_locked(c, now);
		pthread_mutex_unlock(&c->lock);
		if (stalled) {
			log_warn("conn %llu (pid %d): %u requests waited %u ms for ring room; closing",
				 (unsigned long long)c->serial, (int)c->pid, stalled,
				 s->p.stall_ms);
			STAT(s, s->st.stalled += stalled);
			gpud__close_conn(c, "client is not reading its ring");
		}
	}
	pthread_mutex_lock(&s->pend_lock);
	if (s->backlog == 0) {
		s->timer_wanted = false;
		s->timer_on = false;
		uv_timer_stop(&s->timer);
	}
	pthread_mutex_unlock(&s->pend_lock);
}
