/* The progress thread: takes the application's requests, answers activations from peers, and
 * advances every collective this rank is part of, while the application thread computes.
 *
 * It must not burn a core while there is nothing to do (these runs oversubscribe cores): after a
 * short spell of polling with sched_yield it sleeps on a condition variable with exponential
 * back-off: 20 us doubling to 100 us while a collective is in flight (peers' data may arrive any
 * moment), to 500 us in the first 50 ms of idleness (the next activation usually comes soon), then
 * to 2 ms. That bounds the added activation latency by 2 ms while an idle engine costs about 1% of
 * a core (each wake-up is an MPI progress poll). An application call wakes it at once. */
#include <sched.h>
#include <time.h>

#include "wa_internal.h"

#define BACKOFF_MIN_S 20e-6
#define BACKOFF_MAX_ACTIVE_S 100e-6
#define BACKOFF_MAX_IDLE_S 500e-6
#define BACKOFF_MAX_LONG_IDLE_S 2e-3
#define LONG_IDLE_AFTER_S 50e-3
/* Keep polling this long after the last completed request, plus the time the data in flight
 * needs at 1 GB/s: large transfers progress inside MPI_Test calls, so sleeping would stall them. */
#define SPIN_BASE_S 1e-3
#define SPIN_BYTES_PER_S 1e9

static int poll_control(wa_engine *e, int *progressed) {
  for (;;) {
    int flag = 0;
    MPI_Status st;
    WA_CHECK_MPI(e, MPI_Test(&e->ctrl_req, &flag, &st));
    if (!flag) return WA_OK;
    *progressed = 1;
    wa_msg msg = e->ctrl_in; /* the receive is re-posted into ctrl_in at once */
    WA_CHECK_MPI(e, MPI_Irecv(&e->ctrl_in, WA_MSG_WORDS, MPI_INT64_T, MPI_ANY_SOURCE, WA_TAG_CTRL,
                              e->comm, &e->ctrl_req));
    if (msg.kind == MSG_ACT) {
      int rc = wai_engine_on_act(e, st.MPI_SOURCE, &msg);
      if (rc != WA_OK) return rc;
    } else if (msg.kind == MSG_FIN && !e->fin_from[st.MPI_SOURCE]) {
      e->fin_from[st.MPI_SOURCE] = 1;
      e->fins++;
    }
  }
}

static int advance_all(wa_engine *e, int *progressed, size_t *inflight) {
  *inflight = 0;
  for (wa_coll *c = e->active, *next; c; c = next) {
    next = c->next;
    if (c->stage == STAGE_DATA || c->stage == STAGE_RESULT) {
      int rc = wai_coll_advance(e, c, progressed);
      if (rc != WA_OK) return rc;
    }
    if (c->stage == STAGE_DONE) {
      int rc = wai_engine_complete(e, c);
      if (rc != WA_OK) return rc;
      *progressed = 1;
    } else if (c->stage != STAGE_IDLE) {
      *inflight += wai_coll_bytes(e, c);
    }
  }
  return WA_OK;
}

/* Close completes once every rank has announced its close (so nobody will activate a collective
 * involving us again) and every started collective has finished. */
static int close_ready(wa_engine *e) {
  if (e->fins < e->P - 1) return 0;
  for (wa_coll *c = e->active; c; c = c->next)
    if (c->stage != STAGE_IDLE) return 0;
  int flag = 0;
  if (MPI_Testall(e->P, e->fin_rq, &flag, MPI_STATUSES_IGNORE) != MPI_SUCCESS) {
    wai_engine_fail(e, WA_EMPI, "MPI_Testall on close notices failed");
    return 0;
  }
  if (!flag) return 0;
  /* Nothing can arrive on the control tag any more: every peer's last message was its FIN. */
  MPI_Cancel(&e->ctrl_req);
  MPI_Wait(&e->ctrl_req, MPI_STATUS_IGNORE);
  return 1;
}

static void sleep_on(wa_engine *e, double seconds) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  long ns = ts.tv_nsec + (long)(seconds * 1e9);
  ts.tv_sec += ns / 1000000000L;
  ts.tv_nsec = ns % 1000000000L;
  pthread_cond_timedwait(&e->wake, &e->mu, &ts);
}

static void *progress_main(void *arg) {
  wa_engine *e = arg;
  double last_progress = wa_now(), backoff = BACKOFF_MIN_S;
  pthread_mutex_lock(&e->mu);
  while (!e->stop) {
    if (e->broken) { /* MPI state is unknown: stay quiet until stopped */
      sleep_on(e, BACKOFF_MAX_IDLE_S);
      continue;
    }
    int progressed = wai_engine_take_request(e);
    size_t inflight = 0;
    if (!e->broken) poll_control(e, &progressed);
    if (!e->broken) advance_all(e, &progressed, &inflight);
    if (!e->broken && e->closing && close_ready(e)) {
      e->req->status = WA_OK;
      e->req->done = 1;
      pthread_cond_broadcast(&e->done);
      break;
    }
    double now = wa_now();
    if (progressed) {
      last_progress = now;
      backoff = BACKOFF_MIN_S;
      continue;
    }
    if (inflight > 0 && now - last_progress < SPIN_BASE_S + (double)inflight / SPIN_BYTES_PER_S) {
      pthread_mutex_unlock(&e->mu);
      sched_yield();
      pthread_mutex_lock(&e->mu);
      continue;
    }
    sleep_on(e, backoff);
    double cap = inflight > 0                              ? BACKOFF_MAX_ACTIVE_S
                 : now - last_progress < LONG_IDLE_AFTER_S ? BACKOFF_MAX_IDLE_S
                                                           : BACKOFF_MAX_LONG_IDLE_S;
    backoff = backoff * 2 < cap ? backoff * 2 : cap;
  }
  pthread_mutex_unlock(&e->mu);
  return NULL;
}

int wai_progress_start(wa_engine *e) {
  if (pthread_create(&e->thread, NULL, progress_main, e) != 0) return WA_ENOMEM;
  e->thread_running = 1;
  return WA_OK;
}

void wai_progress_stop(wa_engine *e) {
  if (!e->thread_running) return;
  pthread_mutex_lock(&e->mu);
  e->stop = 1;
  pthread_cond_signal(&e->wake);
  pthread_mutex_unlock(&e->mu);
  pthread_join(e->thread, NULL);
  e->thread_running = 0;
}
