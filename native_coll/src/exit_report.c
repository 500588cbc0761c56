/* The exit report: when MPI aborts this process from inside a call (MPICH treats a peer's broken
 * connection as fatal whatever the error handler: a killed node ends every survivor within a fraction
 * of a second), no exception ever reaches the application. An atexit hook then names, for every
 * engine with a collective in flight, the ranks that had not delivered their part, so the user learns
 * which node was lost. It makes no MPI call and takes no lock the exiting thread may hold (it is
 * often the progress thread itself, inside MPI_Testsome with e->mu held): it reads the engine's
 * state as it stands, which only the exiting process can still change. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "wa_internal.h"

static pthread_mutex_t live_mu = PTHREAD_MUTEX_INITIALIZER;
static wa_engine *live; /* engines created and not yet destroyed */
static pthread_once_t hook_once = PTHREAD_ONCE_INIT;

static void report(void) {
  if (pthread_mutex_trylock(&live_mu) != 0) return;
  for (wa_engine *e = live; e; e = e->next_live) {
    if (e->closed || !e->progress.running) continue;
    for (wa_coll *c = e->active; c; c = c->next) {
      if (c->stage != STAGE_DATA && c->stage != STAGE_RESULT) continue;
      int *missing = malloc(sizeof(int) * (size_t)c->S);
      if (!missing) break;
      int n = wai_coll_missing(c, missing);
      if (n > 0) {
        fprintf(stderr, "native_coll: rank %d%s%s%s is exiting inside MPI while %s iteration "
                "%lld was in flight; rank(s) [", e->rank, e->where ? " (" : "",
                e->where ? e->where[e->rank] : "", e->where ? ")" : "",
                c->is_global ? "global" : "group", (long long)c->t);
        for (int i = 0; i < n; i++) fprintf(stderr, "%s%d", i ? ", " : "", missing[i]);
        fputs("] had not delivered their part", stderr);
        for (int i = 0; e->where && i < n; i++) /* the collective's own "rank R (host, pid)" */
          fprintf(stderr, "%srank %d (%s)", i ? ", " : ": ", missing[i], e->where[missing[i]]);
        fputs("; a lost node, a killed process or a broken link; restart from the last "
              "checkpoint\n", stderr);
        fflush(stderr);
      }
      free(missing);
    }
  }
  pthread_mutex_unlock(&live_mu);
}

static void install_hook(void) { atexit(report); }

void wai_exit_report_register(wa_engine *e) {
  pthread_once(&hook_once, install_hook);
  pthread_mutex_lock(&live_mu);
  e->next_live = live;
  live = e;
  pthread_mutex_unlock(&live_mu);
}

void wai_exit_report_unregister(wa_engine *e) {
  pthread_mutex_lock(&live_mu);
  for (wa_engine **p = &live; *p; p = &(*p)->next_live)
    if (*p == e) {
      *p = e->next_live;
      break;
    }
  pthread_mutex_unlock(&live_mu);
}
