/* The progress thread, a generic loop in the manner of UCC's progress queue: it calls one poll
 * callback (the engine's: take the application's request, answer activations from peers, advance
 * every collective; activation.c) and decides only when to call it again. It knows nothing of
 * collectives.
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

double wai_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void sleep_on(wai_progress *p, double seconds) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  long ns = ts.tv_nsec + (long)(seconds * 1e9);
  ts.tv_sec += ns / 1000000000L;
  ts.tv_nsec = ns % 1000000000L;
  (void)pthread_cond_timedwait(p->wake, p->mu, &ts); /* woken early or timed out: both fine */
}

static void *progress_main(void *arg) {
  wai_progress *p = arg;
  double last_progress = wai_now(), backoff = BACKOFF_MIN_S;
  pthread_mutex_lock(p->mu);
  while (!p->stop) {
    size_t inflight = 0;
    int r = p->poll(p->ctx, &inflight);
    if (r == WAI_POLL_FINISHED) break;
    double now = wai_now();
    if (r == WAI_POLL_PROGRESSED) {
      last_progress = now;
      backoff = BACKOFF_MIN_S;
      continue;
    }
    if (inflight > 0 && now - last_progress < SPIN_BASE_S + (double)inflight / SPIN_BYTES_PER_S) {
      pthread_mutex_unlock(p->mu);
      sched_yield();
      pthread_mutex_lock(p->mu);
      continue;
    }
    sleep_on(p, backoff);
    double cap = inflight > 0                              ? BACKOFF_MAX_ACTIVE_S
                 : now - last_progress < LONG_IDLE_AFTER_S ? BACKOFF_MAX_IDLE_S
                                                           : BACKOFF_MAX_LONG_IDLE_S;
    backoff = backoff * 2 < cap ? backoff * 2 : cap;
  }
  pthread_mutex_unlock(p->mu);
  return NULL;
}

int wai_progress_start(wai_progress *p, pthread_mutex_t *mu, pthread_cond_t *wake,
                       wai_poll_fn poll, void *ctx) {
  p->mu = mu;
  p->wake = wake;
  p->poll = poll;
  p->ctx = ctx;
  p->stop = 0;
  if (pthread_create(&p->thread, NULL, progress_main, p) != 0) return WA_ENOMEM;
  p->running = 1;
  return WA_OK;
}

void wai_progress_stop(wai_progress *p) {
  if (!p->running) return;
  pthread_mutex_lock(p->mu);
  p->stop = 1;
  pthread_cond_signal(p->wake);
  pthread_mutex_unlock(p->mu);
  pthread_join(p->thread, NULL);
  p->running = 0;
}
